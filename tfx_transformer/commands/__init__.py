"""The commands both applications share: `tfx-export`, `tfx-quickstart`, `tfx-serve`."""
