"""`python -m layerslide`: the console script, as torchrun runs it (`torchrun ... -m layerslide
train ...`)."""

import sys

from layerslide.cli.main import main

sys.exit(main())
