"""Qwen4Exp (Qwen3.8-Flash-Next): hyper-connections, hashed n-gram PLE and QSA on the Qwen blocks."""
