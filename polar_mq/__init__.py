"""polar_mq: rollout-as-a-service for agentic RL."""
