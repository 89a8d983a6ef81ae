"""How a ``KeyedJaggedTensor`` prints: torchrec's ``str()`` layout, one dense row per sample.

``str(kjt)`` (what the torchrec tutorial prints)::

    KeyedJaggedTensor({
        "product": [[1, 2, 1], [5]],
        "user": {
            "values": [[2, 3], [4, 1]],
            "weights": [[0.5, 1.0], [2.0, 1.0]]
        }
    })

``repr(kjt)`` is one line: ``KeyedJaggedTensor(keys=['a', 'b'], stride=2, values=(8,), weighted=False)``.

A weighted feature shows its values and weights; an unweighted one only its values. The function
takes the KJT's ``to_dict()`` (plain ``JaggedTensor`` s), not the KJT, so the module needs no
import of the class.
"""

from typing import Dict, List

import torch

from lightrec.sparse.jagged import JaggedTensor, _values_repr

__all__ = ["kjt_repr", "kjt_str"]


def kjt_str(jt_dict: Dict[str, JaggedTensor]) -> str:
    """``str()`` of a KJT from its ``{key: JaggedTensor}`` views, in key order."""
    if len(jt_dict) == 0:
        return "KeyedJaggedTensor()\n"
    lines: List[str] = []
    for key, jt in jt_dict.items():
        dense = list(jt.to_dense())
        dw = jt.to_dense_weights()
        if dw is None:
            lines.append(f'    "{key}": {_values_repr(dense)}')
        else:
            lines.append(
                f'    "{key}": {{\n        "values": {_values_repr(dense)},\n'
                f'        "weights": {_values_repr(list(dw))}\n    }}'
            )
    return "KeyedJaggedTensor({\n" + ",\n".join(lines) + "\n})\n"


def kjt_repr(keys: List[str], stride: int, values_shape: torch.Size, weighted: bool) -> str:
    """``repr()`` of a KJT: its keys, batch size, the shape of its values and whether it is weighted."""
    return f"KeyedJaggedTensor(keys={keys}, stride={stride}, values={tuple(values_shape)}, weighted={weighted})"
