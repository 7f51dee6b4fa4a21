"""Needle in a haystack: ask linzoo's linear students (and their softmax teacher) for a pass key hidden
in long text, and compare their fixed recurrent state with the teacher's growing KV cache.
Only UI wiring lives here; the logic is `niah_space` beside it and `linzoo.evals.niah`, installed with linzoo
(on the Hub from the wheel in the Space repo), so this file runs alike as `python app.py` and `linzoo space`."""

import gradio as gr

from linzoo.spaces.niah import niah_space as space


def build_demo(models: list[str], results: list) -> gr.Blocks:
    """The Space offering `models` (its owner's list: a query naming anything else is refused)."""

    def ask(picked, context_len, depth, needle, seed, prompt_format, haystack, question, answer,
            progress=gr.Progress()):
        try:
            return space.run_query(picked, context_len, depth, needle, seed, prompt_format, haystack, question,
                                   answer, progress, allowed=models)
        except (ValueError, FileNotFoundError) as err:
            raise gr.Error(str(err)) from err

    with gr.Blocks(title="linzoo NIAH") as demo:
        gr.Markdown("# linzoo: needle in a haystack\nLinearized SmolLM2 students keep a fixed-size state "
                    "instead of a KV cache. Can they still find the needle?")
        with gr.Tab("Ask"):
            with gr.Row():
                picked = gr.Dropdown(models, value=models[:1], multiselect=True, max_choices=space.MAX_MODELS,
                                     label=f"models (1-{space.MAX_MODELS})")
                needle = gr.Radio(list(space.VARIANT_CHOICES), value="passkey", elem_id="needle",
                                  label="needle (a NIAH variant, or custom: your own)")
                prompt = gr.Radio(["raw", "chat"], value="raw", label="prompt format")
            offered = gr.Dataframe(headers=space.MODEL_HEADERS, label="the models: state and measured decoding speed",
                                   interactive=False, wrap=True, column_widths=space.MODEL_WIDTHS, elem_id="models")
            with gr.Row():
                context = gr.Slider(128, space.MAX_CONTEXT, value=1024, step=128, label="context length (tokens)",
                                    elem_id="context")
                depth = gr.Slider(0, 1, value=0.5, step=0.05, label="needle depth (0 = start, 1 = end)")
                # No precision=0: Gradio's int() of NaN would fail raw; run_query refuses what is not whole.
                seed = gr.Number(0, minimum=0, maximum=space.MAX_SEED, step=1, label="seed (picks the needle and "
                                 "the filler)")
            with gr.Accordion("Your own haystack (needle: custom)", open=False, elem_id="custom"):
                haystack = gr.Textbox(lines=6, label="haystack", elem_id="custom-haystack")
                question = gr.Textbox(label="question", elem_id="custom-question")
                answer = gr.Textbox(label="expected answer", elem_id="custom-answer")
            run = gr.Button("Find the needle", variant="primary", elem_id="run")
            table = gr.Dataframe(headers=space.RESULT_HEADERS, label="answers", interactive=False, wrap=True,
                                 column_widths=space.RESULT_WIDTHS, elem_id="answers")
            shown = gr.HTML(label="haystack", elem_id="haystack")
        with gr.Tab("Measured results"):
            note = gr.Markdown(elem_id="results-note")
            gallery = gr.Gallery(label="heatmaps", columns=2)
            tables = [gr.Dataframe(headers=list(spec.space_headers), label=spec.title, interactive=False)
                      for spec in space.result_tables()]
        run.click(ask, [picked, context, depth, needle, seed, prompt, haystack, question, answer], [shown, table],
                  api_name="ask")
        demo.load(lambda: space.results_view(results), None, [note, gallery, *tables],
                  api_name="results")
        demo.load(lambda: space.model_rows(models), None, offered, api_name="models")
    return demo


def main(argv: list[str] | None = None) -> int:
    """`python app.py` on the Hub (no flags: its environment says everything), `linzoo space [flags]` locally."""
    host, port = space.apply_flags(argv)
    results = space.results_paths()
    space.launch(build_demo(space.check_models(space.default_models()), results), results, host, port)
    return 0


if __name__ == "__main__":
    main()
