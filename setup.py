"""Which packages the distribution installs, and from where: the only thing pyproject.toml
cannot say declaratively. The repository shows the testbed's three programs side by side
(testbed/, the orchestrator; controllers/, the OpenFlow apps the controller process runs;
traffic/, what runs inside emulated hosts), but installed they all live under the one import
name ``testbed`` (as testbed.controllers and testbed.traffic), so the wheel adds no generic
top-level name such as ``traffic`` to site-packages. Every package below those three folders
is found here, so a new subpackage needs no line of its own."""
from setuptools import find_packages, setup

# Import name -> folder, for the programs that live outside testbed/.
PROGRAMS = {"testbed.controllers": "controllers", "testbed.traffic": "traffic"}

packages = find_packages(include=["testbed", "testbed.*"])
for name, folder in PROGRAMS.items():
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]

setup(packages=packages, package_dir=PROGRAMS)
