"""Server-side loops of the fedclust methods (thin Flower adapters over ``fedclust``)."""
