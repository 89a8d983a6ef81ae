"""A MovieLens-shaped synthetic data set with a planted signal: the recipes' offline default.

``synthetic_movielens()`` returns the same :class:`~lightrec.data.MovieLensData` that
:func:`~lightrec.data.read_movielens` returns for a real release (ml-100k's shape by default:
943 users, 1682 movies, 100k ratings, 19 genres, gender / age / occupation per user), so every
MovieLens code path -- the CTR and retrieval tasks, random and time splits, the recipes'
tables -- runs on it without a download.

The signal (what a model can learn, so a recipe's metrics move away from chance)::

    user u: taste vector  a_u ~ N(0, I_F),  bias b_u          movie m: vector v_m ~ N(0, I_F), bias c_m
    score(u, m) = a_u . v_m / sqrt(F) + b_u + c_m
    rating      = clip(round(2.7 + 1.1 * score + noise), 1, 5),  noise ~ N(0, 0.6)

Users pick the movies they rate with probability ``softmax(popularity + score)`` (popular and
well-liked movies get more ratings, as in the real data). A movie's genres are the ``1..3``
genres whose random direction in taste space its vector points closest to, so genres and the
user side features (``age`` shifts the bias, ``gender`` flips one taste axis) carry signal too.
"""

from __future__ import annotations

import numpy as np

from lightrec.data.movielens.reader import ML100K_GENRES, MovieLensData, genres_csr

__all__ = ["synthetic_movielens"]

_FACTORS = 8
_AGE_GROUPS, _OCCUPATIONS = 7, 21


def _genres_per_movie(vectors: np.ndarray, rng: np.random.Generator) -> list[list[int]]:
    """1 to 3 genre ids (1-based) per movie: the genre directions its vector is closest to."""
    directions = rng.standard_normal((len(ML100K_GENRES), vectors.shape[1]))
    affinity = vectors @ directions.T  # [movies, genres]
    counts = rng.integers(1, 4, size=len(vectors))
    order = np.argsort(-affinity, axis=1)
    return [sorted(int(g) + 1 for g in order[m, : counts[m]]) for m in range(len(vectors))]


def synthetic_movielens(
    num_users: int = 943, num_movies: int = 1682, num_ratings: int = 100_000, seed: int = 0
) -> MovieLensData:
    """Ratings of ``num_users`` users on ``num_movies`` movies with a planted preference structure.

    Args:
        num_users / num_movies: ids ``1..num_users`` / ``1..num_movies`` (``0`` is padding).
        num_ratings: interactions, in increasing timestamp order (a time split is meaningful).
        seed: everything is a function of it.

    Returns:
        A :class:`MovieLensData`, as ``read_movielens`` gives for a real release (ml-100k's shape).

    Raises:
        ValueError: a size is not positive.
    """
    for name, value in (("num_users", num_users), ("num_movies", num_movies), ("num_ratings", num_ratings)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0 (numpy seeds the data with it), got {seed!r}")
    rng = np.random.default_rng(seed)
    taste = rng.standard_normal((num_users, _FACTORS))
    gender = rng.integers(1, 3, size=num_users)  # 1, 2
    taste[:, 0] *= np.where(gender == 1, 1.0, -1.0)  # gender flips one taste axis
    age = rng.integers(1, _AGE_GROUPS + 1, size=num_users)
    occupation = rng.integers(1, _OCCUPATIONS + 1, size=num_users)
    user_bias = 0.15 * (age - _AGE_GROUPS / 2) / _AGE_GROUPS + 0.3 * rng.standard_normal(num_users)
    vectors = rng.standard_normal((num_movies, _FACTORS))
    movie_bias = 0.4 * rng.standard_normal(num_movies)
    popularity = 1.5 * rng.standard_normal(num_movies)

    users = rng.integers(0, num_users, size=num_ratings)
    items = np.empty(num_ratings, dtype=np.int64)
    for u in np.unique(users):  # each user draws its movies by popularity + liking
        rows = np.flatnonzero(users == u)
        score = vectors @ taste[u] / np.sqrt(_FACTORS) + movie_bias
        logits = popularity + score
        p = np.exp(logits - logits.max())
        items[rows] = rng.choice(num_movies, size=len(rows), p=p / p.sum())
    score = np.einsum("nf,nf->n", taste[users], vectors[items]) / np.sqrt(_FACTORS)
    score += user_bias[users] + movie_bias[items]
    noise = 0.6 * rng.standard_normal(num_ratings)
    rating = np.clip(np.round(2.7 + 1.1 * score + noise), 1, 5).astype(np.float32)

    genre_offsets, genre_values = genres_csr(_genres_per_movie(vectors, rng))
    user_features = {
        name: np.concatenate([[0], column]).astype(np.int64)
        for name, column in (("gender", gender), ("age", age), ("occupation", occupation))
    }
    return MovieLensData(
        user=users.astype(np.int64) + 1,
        item=items + 1,
        rating=rating,
        timestamp=np.sort(rng.integers(874_724_710, 893_286_638, size=num_ratings)).astype(np.int64),
        genre_offsets=genre_offsets,
        genre_values=genre_values,
        genre_names=list(ML100K_GENRES),
        raw_user_ids=np.arange(1, num_users + 1, dtype=np.int64),
        raw_item_ids=np.arange(1, num_movies + 1, dtype=np.int64),
        user_features=user_features,
        num_embeddings={
            "userId": num_users + 1,
            "movieId": num_movies + 1,
            "genres": len(ML100K_GENRES) + 1,
            "gender": 3,
            "age": _AGE_GROUPS + 1,
            "occupation": _OCCUPATIONS + 1,
        },
    )
