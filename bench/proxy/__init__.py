"""`python -m bench.proxy`: the proxy's added latency, CPU per request and log-writer throughput.

(a) added latency vs calling the fake upstream directly, 64 concurrent clients, streaming and not;
(b) proxy CPU per non-streaming request; (c) LiteLLM's proxy side by side when it is installed;
(d) call records/s into PostgreSQL and the proxy's latency while its writer logs 1k-token calls.
See bench/README.md.
"""
