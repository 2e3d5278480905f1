wrk.method = "POST"
wrk.body = '{"model":"agent","stream":false,"messages":[{"role":"user","content":"What is 1 + 2 + 3 + 4 + 5 + 6 + 7?"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer pmq_896b5de7fc5b45488f86375b0ad969f6_1796346056_3925cedf6c0152cd49a0954c790ebd4e"
