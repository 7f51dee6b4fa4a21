"""The NIAH Space: `niah_space` (the logic, tested) and `app` (its Gradio wiring, what the Hub runs)."""
