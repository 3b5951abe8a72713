import sys

from learntok.cli import main

sys.exit(main())
