"""DDP itself, phase by phase (walk-through in ddp-facts.md). Imports torch and
ddpviz.events only, never UI code."""
