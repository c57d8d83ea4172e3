"""layerslide: fine-tune LLMs larger than GPU memory on one GPU by sliding a window over the layers."""

__version__ = "0.1.0"
