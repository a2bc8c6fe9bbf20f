"""Every PNG a tool writes keeps its text inside the image (the benchmark's title once ran off both edges)."""

import pytest

from imagenet_shards.formats import format_names


def _row(label, kind, fmt, normalization="device", value=1000.0):
    return {"label": label, "kind": kind, "format": fmt, "normalization": normalization, "workers": 2,
            "images_per_s": value, "images_per_s_per_worker": value / 2, "images_per_cpu_s": value / 3}


def _goal(goal, row, ratio):
    return {"goal": goal, "row": row, "ratio": ratio, "threshold": 0.8, "status": "met" if ratio >= 0.8 else "not met"}


def text_outside_figure(figure) -> list:
    """What of `figure`, as drawn, leaves it: [] when all of it is inside, else the drawn texts whose
    extent leaves it (or the overall extent, in inches, when no single text is to blame)."""
    figure.canvas.draw()  # at the figure's own dpi: the extents below are in its pixels
    renderer = figure.canvas.get_renderer()
    tight = figure.get_tightbbox(renderer)  # inches, of what was drawn (ticks outside the axes are not)
    width, height = figure.get_size_inches()
    if tight.x0 >= -0.01 and tight.y0 >= -0.01 and tight.x1 <= width + 0.01 and tight.y1 <= height + 0.01:
        return []
    outside = []
    for text in figure.findobj(lambda artist: hasattr(artist, "get_text") and hasattr(artist, "get_window_extent")):
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > figure.bbox.width + 0.5 or box.y1 > figure.bbox.height + 0.5:
            outside.append((text.get_text()[:80], tuple(round(v) for v in box.extents)))
    return outside or [("the figure's drawn extent", tuple(round(v, 2) for v in tight.extents))]


@pytest.mark.parametrize("goal_count", [0, 1, 6])
def test_comparison_plot_title_and_goals_stay_inside_the_image(goal_count):
    import matplotlib.pyplot as plt

    from imagenet_shards.hostbench.report import comparison_figure

    rows = [_row("bare decode+augment, 1 process (the ceiling)", "ceiling", "img", "host")]
    rows += [_row(f"{fmt}, device normalisation", "loader", fmt) for fmt in format_names()]
    rows += [_row("ImageFolder + DataLoader (baseline)", "baseline", "folder", "host", 400.0)]
    goals = [_goal(name, f"{name}/device-a-long-row-name", 0.5 + n / 10) for n, name in
             enumerate(["jpeg_vs_bare", "jpeg_crop_decode_vs_bare", "jpeg_vs_imagefolder", "tensor_vs_stock_npy",
                        "img_verify_cost", "tensor_verify_cost"][:goal_count])]
    config = {"split": "train", "batch_size": 256, "workers": 16, "instances": 8, "cpus": 64,
              "created": "2026-11-25T10:00:00+00:00"}
    figure = comparison_figure(rows, config, goals)
    try:
        assert text_outside_figure(figure) == []
        # the goals are all in the title, one a line
        title = figure.get_suptitle()
        assert all(goal["row"] in title for goal in goals)
        assert title.count("\n") >= goal_count
    finally:
        plt.close(figure)


def test_the_check_fails_on_text_that_runs_off_the_edge():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(4, 3))
    figure.suptitle("a title far too long for a four-inch figure " * 4, fontsize=10)
    try:
        assert text_outside_figure(figure)
    finally:
        plt.close(figure)
