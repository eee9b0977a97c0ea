"""ninfer compiler: artifact -> frontend -> passes -> codegen -> package."""
