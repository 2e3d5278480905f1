"""The four stages; each module tells the whole story of its stage."""
