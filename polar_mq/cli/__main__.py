"""`python -m polar_mq.cli`: what the tests and `polar_mq.stack.devstack` start processes with."""

from polar_mq.cli import main

if __name__ == "__main__":  # not when multiprocessing imports it as `__mp_main__`
    main()
