"""Where the proxy's calls go: the call record (`record`), its bounded in-memory batches and
the writer thread (`writer`, `sink`, `call_insert`, `call_store`, `call_log`), the durable spill
while the database is down (`spill`, `spill_records`, `spill_layout`), per-rollout numbering
(`seq`, `seq_floor`) and the receipts agents wait on (`receipts`).
"""
