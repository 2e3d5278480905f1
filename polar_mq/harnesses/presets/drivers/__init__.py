"""Driver scripts for harnesses that are libraries, not programs (run by file path with the
harness install's own Python; each imports only its harness library and the standard library)."""
