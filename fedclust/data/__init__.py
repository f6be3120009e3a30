"""Datasets, partitioners and federated preprocessing."""

from fedclust.data.tabular import DATASETS, Dataset, DatasetError, load_dataset

__all__ = ["DATASETS", "Dataset", "DatasetError", "load_dataset"]
