import sys

from tofu_mx.cli import main

sys.exit(main())
