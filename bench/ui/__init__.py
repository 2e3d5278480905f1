"""Dashboard page load times on a large synthetic job (see bench/README.md)."""
