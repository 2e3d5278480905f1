"""Tenants: who owns a job, what an API key may do, and how much one tenant may ask for.

A tenant is a name carried by API keys and stamped on every job they submit. Keys see their own
tenant's jobs only (the `admin` scope sees every tenant); quotas bound what one tenant can put in
the queue. See docs/security.md.
"""
