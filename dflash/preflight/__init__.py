"""`python -m dflash.preflight`: a command checked at its real sizes before it runs."""
