"""Plain data every part shares: fabric descriptions (topology/) and the records the controller and the testbed exchange. Imports nothing else of the testbed."""
