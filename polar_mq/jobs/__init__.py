"""Jobs: submission, status and results."""
