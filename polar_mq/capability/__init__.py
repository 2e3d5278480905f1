"""What a rollout's agent is given and what the proxy holds it to: the capability token that is
its API key (`tokens.py`), the sampling policy carried in it (`sampling.py`), and the receipts by
which run-agent knows every call of the attempt is stored (`receipts.py`).
"""
