"""drop-layers' up-front shape: what a later step can be told before the layers are chosen."""
import pytest

from compressor.passes.layers import DropLayers
from compressor.passes.pruning import PruneFFN, PruneHeads
from compressor.passes.registry import Known, Shape, shape_after
from compressor.passes.sharing import ShareLayers
from pretrain.errors import UserError

START = Shape("bert", layers=4, heads=(4,) * 4, hidden=32, ffn=(64, 64, 48, 48))   # widths a saved record gives


def after(*chain) -> Shape:
    known = Known(model=START, teacher=START, train_rows=1000)
    for name, config in chain:
        known = shape_after(name, config, known)
    return known.model


def test_layers_chosen_by_count_keep_a_size_every_layer_had():
    shape = after(("drop-layers", DropLayers(count=2)))
    assert (shape.layers, shape.heads, shape.ffn) == (2, (4, 4), None)
    assert shape.heads_vary is None and "FFN widths (64, 64, 48, 48)" in shape.ffn_vary
    assert after(("drop-layers", DropLayers(keep=(0, 3)))).heads == (4, 4)


@pytest.mark.parametrize("prune, mode, what", [
    (("prune-heads", PruneHeads(per_layer=(1, 2, 1, 2))), "attention", r"head counts \(3, 2, 3, 2\)"),
    (("prune-heads", PruneHeads(per_layer=(1, 1, 1, 1))), "attention", None),
    (None, "ffn", r"FFN widths \(64, 64, 48, 48\)"),
    (("prune-ffn", PruneFFN(fraction=0.5)), "all", "prune-ffn before it with scope: global"),
])
def test_sharing_layers_a_count_chooses_among_different_sizes_is_refused_up_front(prune, mode, what):
    """drop-layers by count among layers of different head counts (or FFN widths) may keep
    layers of different shapes: a share-layers after it was refused only once the steps before
    had run (and trained); layers all of one size stay shareable."""
    chain = (prune,) * (prune is not None) + (("drop-layers", DropLayers(count=2)),
                                               ("share-layers", ShareLayers(mode=mode)))
    if what is None:        # every layer keeps 3 heads: whichever two the count keeps
        assert after(*chain[:2]).heads == (3, 3)
        after(*chain)
        return
    with pytest.raises(UserError, match=f"^share-layers: layers 0 to 1 may .*: .*{what}") as err:
        after(*chain)
    assert "\n" not in str(err.value)
    if "drop-layers" in str(err.value):
        assert "expected drop-layers with keep:" in str(err.value)
