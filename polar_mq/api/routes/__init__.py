"""HTTP routes: thin adapters from requests to the services in `polar_mq.jobs`."""
