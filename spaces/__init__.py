"""The Hub Spaces, a folder each: the folder is the Space repo's source, and its Python is this subpackage of linzoo,
which the Space installs from the linzoo wheel uploaded beside it."""
