"""Reading and writing files: images (OpenCV), volumes (tifffile), atomic output."""
