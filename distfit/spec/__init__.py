"""The spec stage: a pipeline spec (YAML) validated into frozen dataclasses.

The schema reference is ``pipelines/README.md`` ("Schema reference"). Import each name from the
module that defines it (nothing is re-exported here):

- :mod:`distfit.spec.model`: the dataclasses (``PipelineSpec``, ``AttributeSpec``, ...),
  ``SpecError``, the canonical form and the spec hash;
- :mod:`distfit.spec.parse`: YAML and plain data -> ``PipelineSpec`` (``load_spec``, ``parse_spec``);
- :mod:`distfit.spec.groups`: the query groups, written out or as the ``marginals`` shorthand;
- :mod:`distfit.spec.queries`: the query kinds of one attribute -> ``AttributeQuery``;
- :mod:`distfit.spec.targets`: per-query targets (numbers, lists, files, rules) and their check;
- :mod:`distfit.spec.schema`: the keys each section accepts and the query kinds;
- :mod:`distfit.spec.fields`: field checks that raise ``SpecError`` naming the field.
"""
