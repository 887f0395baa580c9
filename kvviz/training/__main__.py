"""`python -m kvviz.training`: retrain the shipped model from nothing (see kvviz/training/train.py)."""
import sys

from kvviz.training.train import main

sys.exit(main())
