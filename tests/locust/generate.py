# tests/locust/generate.py: a locust load on llm-serve's TGI endpoint,
# /generate, with the request shapes TGI's own load tests send: a prefix of
# a sentence (cut at a random length) and 20 new tokens, once greedy and
# once sampled with top_p 0.9, both with a float seed in [0, 1) as Python's
# random() gives it (llm-serve derives a 64-bit seed from it, see
# llm-serve(1)). A response counts as a success only when it is 200 and
# carries a generated_text string.
#
#   locust -f tests/locust/generate.py --headless -u 20 -r 20 -t 20s --host http://127.0.0.1:8080
#
# LLM_LOCUST_WAIT="MIN,MAX": each user's pause between requests in seconds
# (default 1,5).
import os
import random

from locust import HttpUser, between, task

PHRASES = [
    'Once upon a time, a little girl named Lily found a shiny stone in the park.',
    'The dog ran after the red ball and jumped into the cold river.',
    'Tom wanted to build a tall tower with his blocks before his mom came home.',
    'One sunny morning, the old cat sat by the window and watched the birds.',
    'Sam and his friend went to the shop to buy a big box of crayons.',
    'The little boat sailed far away, over the waves, to an island full of trees.',
]

lo, hi = (float(x) for x in os.environ.get('LLM_LOCUST_WAIT', '1,5').split(','))


class TgiClient(HttpUser):
    wait_time = between(lo, hi)

    def ask(self, name, parameters):
        text = random.choice(PHRASES)
        body = {'inputs': text[:random.randrange(1, len(text))], 'parameters': parameters}
        with self.client.post('/generate', json=body, name=name, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f'HTTP {r.status_code}: {r.text[:200]}')
                return
            try:
                ok = isinstance(r.json().get('generated_text'), str)
            except ValueError:
                ok = False
            if ok:
                r.success()
            else:
                r.failure(f'no generated_text in {r.text[:200]}')

    @task
    def greedy(self):
        self.ask('/generate greedy', {'max_new_tokens': 20, 'seed': random.random()})

    @task
    def sampled(self):
        self.ask('/generate sampled', {'max_new_tokens': 20, 'do_sample': True, 'top_p': 0.9,
                                       'seed': random.random()})
