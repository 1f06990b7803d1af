"""ripieno: many views of one model, trained with Lightning.

The installed package has three parts, each kept in its own folder of the repository:

* ``ripieno.framework`` (``framework/``): torch layers, LightningModules, metrics and the CLI;
* ``ripieno.callbacks`` (``callbacks/``): Lightning callbacks for ripieno's modules and users' own;
* ``ripieno.datamodules`` (``datamodules/``): LightningDataModules for the shipped and users' data.

The shipped recipes (``recipes/``) install as data under ``ripieno/recipes``; ``ripieno recipes``
lists them. Importing ripieno changes nothing in the host process.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ripieno")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
