"""GLM5Next (GLM-5.3-Flash): KDA + sparse MLA hybrid with mHC residual streams and sigmoid-routed MoE."""
