"""How a ``KeyedJaggedTensor`` prints: torchrec's ``str()`` layout, one dense row per sample.

``str(kjt)`` (what the torchrec tutorial prints)::

    KeyedJaggedTensor({
        "product": [[1, 2, 1], [5]],
        "user": {
            "values": [[2, 3], [4, 1]],
            "weights": [[0.5, 1.0], [2.0, 1.0]]
        }
    })

A weighted feature shows its values and weights; an unweighted one only its values. The function
takes the KJT's ``to_dict()`` (plain ``JaggedTensor`` s), not the KJT, so the module needs no
import of the class.
"""

from typing import Dict, List

from lightrec.sparse.jagged import JaggedTensor, _values_repr

__all__ = ["kjt_str"]


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
