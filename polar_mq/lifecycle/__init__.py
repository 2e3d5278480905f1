"""The rollout lifecycle: its states, its transitions and the messages that move it.

Every write of a rollout's status lives here, as a compare-and-set UPDATE (admit, claim, finish,
fail, retry, restart, resume, cancel, early stop), together with the stage order, the stage
messages and their after-commit publish, and the one definition of a complete group. It depends
on `polar_mq.models` only; policy, jobs, the API and the workers build on it, never the reverse.
"""
