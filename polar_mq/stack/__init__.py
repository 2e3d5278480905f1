"""polar_mq's processes started together on one machine: the local stack (`devstack`) behind
`polar-mq demo`, `polar-mq up` and the end-to-end tests, and the demo itself.
"""
