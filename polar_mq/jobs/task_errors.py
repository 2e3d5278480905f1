"""The error of every task source `polar-mq submit` reads: a job or tasks file, Harbor task
folders, a Hugging Face dataset.

Its own module because each source raises it and `tasks_file` dispatches to the others: kept in
one of them, it made the dispatcher and a source import each other.
"""

from __future__ import annotations


class TasksFileError(ValueError):
    """A job or tasks file that cannot be read or does not hold valid tasks."""
