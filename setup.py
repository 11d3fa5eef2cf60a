"""tofu_mx: automatic partitioning of very large MXNet models across several devices."""
from setuptools import find_packages, setup

setup(
    name="tofu_mx",
    version="0.1.0",
    description="Tofu-style automatic tensor partitioning for Apache MXNet 1.9.1 and Gluon",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tofu_mx", "tofu_mx.*", "nnvm_passes", "nnvm_passes.*"]),
    install_requires=[
        # MXNet 1.9.1 uses numpy aliases removed in numpy 1.24.
        "numpy>=1.21,<1.24",
        # MXNet's own pin; the graph view of `draw` also needs the `dot` program (Debian
        # package graphviz).
        "graphviz>=0.8.1,<0.9",
        # `draw`'s layer view. matplotlib 3.7 runs on numpy 1.23 (pip keeps the pin above);
        # pyparsing 3.3 deprecates the names matplotlib 3.7 calls, a warning per figure.
        "matplotlib>=3.6,<3.8", "pyparsing>=2.3.1,<3.3",
        "tqdm>=4.60",
        # the exact reference for the search (an integer program, solved by the bundled CBC)
        "pulp>=2.7,<4",
    ],
    extras_require={
        "cpu": ["mxnet==1.9.1"],
        # Needs the CUDA 11.2 runtime libraries and cuDNN 8 on the machine to import.
        "gpu": ["mxnet-cu112==1.9.1"],
        # examples/: scikit-learn's bundled digits. Ranges installed and tested with numpy
        # 1.23.5 (scikit-learn 1.3.2, scipy 1.11.4): MXNet 1.9.1 needs numpy < 1.24.
        "examples": ["scikit-learn>=1.2,<1.4", "scipy>=1.9,<1.12"],
        # bench/paper.py's plots use matplotlib, installed for `draw`
        "bench": [],
        # gluonnlp 0.10 supplies models nobody on this project wrote (BERT, Transformer, LMs);
        # scikit-learn and scipy: tests/examples runs the example scripts; pytest-xdist
        # runs the suite in two processes (`make test`)
        # GluonCV 0.10.5's model zoo: installed by `make test` without its dependencies (its
        # own pins pull a numpy that breaks MXNet); these are what it needs at import
        "test": ["pytest>=7", "pytest-timeout>=2.1", "pytest-xdist>=3.5", "gluonnlp==0.10.0",
                 "scikit-learn>=1.2,<1.4", "scipy>=1.9,<1.12",
                 "opencv-python-headless>=4.5,<4.9", "autocfg", "yacs", "portalocker"],
    },
    entry_points={"console_scripts": ["tofu-mx=tofu_mx.cli:main"]},
)
