"""`python -m polar_mq.cli`: what the tests and `polar_mq.devstack` start processes with."""

from polar_mq.cli import main

main()
