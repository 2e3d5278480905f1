"""`python -m polar_mq.training`: see `polar_mq.training.run` (and `bash scripts/train`)."""

import sys

from polar_mq.training.run import main

sys.exit(main())
