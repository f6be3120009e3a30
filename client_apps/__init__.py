"""The fedclust ClientApp and its handlers."""
