"""ninfer runtime: loads compiled packages and serves them; never imports the compiler."""
