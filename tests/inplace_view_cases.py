"""In-place ops through views, written once for both tensor types (torch's and kiln's): each takes a [4, 12]
tensor and returns what the writes left (tests/serde/test_inplace_views.py reads them from torch's .pt2 files,
tests/frontend/test_inplace_views.py traces them with kiln.export)."""


def _keys_from_two_parts(x):  # DeepSeek-V3's key_states: new_empty, then two slices written by copy_
    keys = x.new_empty(x.shape[0], 4, 12)
    keys[..., :8] = x[..., :8].unsqueeze(1)
    keys[..., 8:] = x[..., 8:12].unsqueeze(1).expand(-1, 4, -1)
    return keys * 2


def _select_then_scale(x):
    y = x.clone()
    y[1].mul_(3)
    return y


def _transpose_select_fill(x):  # two views deep
    y = x.clone()
    y.transpose(0, 1)[2].fill_(-1)
    return y


def _flat_view_slice_zero(x):
    y = x.clone()
    y.view(-1)[3:9].zero_()
    return y


def _permuted_row(x):
    y = x.clone().reshape(2, 3, -1)
    y.permute(2, 0, 1)[1].add_(10)
    return y


def _diagonal(x):  # no scatter op of its own: written back by element positions
    y = x.clone()[:, :5]
    y.diagonal().add_(5)
    return y


def _split_part(x):
    y = x.clone()
    first, second = y.split([5, 7], dim=1)
    second.mul_(-2)
    return y + first.sum()


def _unbind_row(x):
    y = x.clone()
    rows = y.unbind(0)
    rows[2].zero_()
    return y


def _stale_sibling(x):  # a view made before its base changed reads the new values
    y = x.clone()
    column = y[:, 1]
    y.add_(1)
    return column * 1


def _sibling_through_a_view(x):
    y = x.clone()
    left, right = y[:, :6], y[:, 6:]
    y[:, 4:8].mul_(0)
    return left + right


def _view_of_an_unused_view(x):  # the middle view is read no more after `row`: the write still reaches `row`
    y = x.clone()
    row = y[:, 2:10][1]
    y.add_(1)
    return row * 1


CASES = [_keys_from_two_parts, _select_then_scale, _transpose_select_fill, _flat_view_slice_zero, _permuted_row,
         _diagonal, _split_part, _unbind_row, _stale_sibling, _sibling_through_a_view, _view_of_an_unused_view]
