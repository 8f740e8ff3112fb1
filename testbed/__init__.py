"""AI data-center fabric testbed: real OVS switches, an os-ken controller, AI traffic, measured."""
__version__ = "0.1.0"
