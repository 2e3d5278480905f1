"""Software-engineering tasks: a repository checked out into the workspace, hidden tests that
only the grader sees, and the workspace diff as the evaluated artifact.

Kept apart from the stages and evaluators that use it so each piece (task spec, checkout, diff,
hidden tests, JUnit reports) can be read and tested on its own.
"""
