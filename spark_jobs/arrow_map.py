"""``DataFrame.mapInArrow`` without requiring pandas.

PySpark builds ``mapInArrow`` on top of ``pandas_udf``, which refuses to run when pandas is not
installed, although nothing on the Arrow path uses pandas (the worker streams pyarrow record
batches). eosink does not depend on pandas, so when it is missing the same plan is built from the
same pieces PySpark uses (a ``SQL_MAP_ARROW_ITER_UDF`` user-defined function handed to the JVM's
``Dataset.mapInArrow``). With pandas installed the public method is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame


def map_in_arrow(
    df: DataFrame, func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], schema: str
) -> DataFrame:
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        # PySpark hands func an iterator of batches; its annotation promises only an iterable
        return df.mapInArrow(func, schema)  # type: ignore[arg-type]
    from pyspark.rdd import PythonEvalType
    from pyspark.sql.udf import UserDefinedFunction

    udf = UserDefinedFunction(func, returnType=schema, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[c] for c in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)
