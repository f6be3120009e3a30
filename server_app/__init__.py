"""The fedclust ServerApp."""
