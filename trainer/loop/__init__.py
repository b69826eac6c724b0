"""When things happen: the controller (the outer loop, read top to bottom in
controller.py's `Trainer.train`), the compiled steps, and the Actions asked
"is it time?" at loop boundaries (eval, save, keep-best, profile, progress,
summaries, a user's own).

It knows no model and no loss: what one step does is the task's (trainer/task/).
"""
