"""Infrastructure every layer stands on, knowing nothing of jobs: the database engine and
migrations, JSON as stored, statements run on the driver's cursor, the error base, TLS, ports,
child processes (forked or spawned) and the HTTP servers' request guards.
"""
