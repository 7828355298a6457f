"""Write ``pipelines/adult.yaml``: all 3-way marginals of the 14 attributes of the UCI Adult data.

Run from anywhere: ``python pipelines/generate_adult.py`` (deterministic; it writes only
``adult.yaml`` next to this script; ``--check`` exits 1 if that file is out of date).

The data is ``pipelines/data/adult.csv`` (a copy of the UCI "Adult" extract of the 1994 US
Current Population Survey: 32,561 people, 14 columns; public, CC BY 4.0, see
``pipelines/data/README.md``). Each column becomes one attribute:

* the continuous columns (age, fnlwgt, capital-gain, capital-loss, hours-per-week) are binned
  into ordinal attributes (``bins``);
* education is recoded into 8 ordered levels (ordinal); workclass, marital-status, occupation
  and native-country are recoded into fewer groups (``recode``; "?" is its own value
  ``unknown``), so that every 3-way clique stays small (at most 8 x 8 x 6 = 384 cells);
* relationship, race, sex and income keep their labels.

Every one of the C(14, 3) = 364 attribute triples is a query group; ordinal attributes are
queried by ``prefix`` (at most this bin: cumulative counts), the others by ``identity``. Targets
follow the rule ``{base: 100, width_power: 0.5, jitter: 0.5}``: a standard deviation of about 10
people for a single marginal cell, looser (by the square root of the cells read) for wide prefix
queries, with a fixed pseudo-random spread of up to 50% (``pipelines/README.md``, "target").
Accuracy first: distfit finds the smallest privacy cost that meets all of them. Residual
blocks are not merged (``blocks.merge: false``): 470 blocks of at most 210 basis rows, about a
second each, where merged 3-way cliques (up to 616 basis rows, ~10,000 queries) take minutes.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generated.py, when loaded by path
from generated import write_or_check  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "adult.yaml"
TARGET_RULE = {"base": 100, "width_power": 0.5, "jitter": 0.5}

EDUCATION = {
    "Preschool": "elementary", "1st-4th": "elementary", "5th-6th": "elementary", "7th-8th": "elementary",
    "9th": "some-high-school", "10th": "some-high-school", "11th": "some-high-school",
    "12th": "some-high-school", "HS-grad": "high-school", "Some-college": "some-college",
    "Assoc-voc": "associate", "Assoc-acdm": "associate", "Bachelors": "bachelors",
    "Masters": "advanced", "Prof-school": "advanced", "Doctorate": "advanced",
}
WORKCLASS = {
    "Private": "private", "Self-emp-not-inc": "self-employed", "Self-emp-inc": "self-employed",
    "Federal-gov": "government", "State-gov": "government", "Local-gov": "government",
    "Without-pay": "not-paid", "Never-worked": "not-paid", "?": "unknown",
}
MARITAL = {
    "Married-civ-spouse": "married", "Married-AF-spouse": "married",
    "Married-spouse-absent": "spouse-absent", "Separated": "separated-divorced",
    "Divorced": "separated-divorced", "Never-married": "never-married", "Widowed": "widowed",
}
OCCUPATION = {
    "Exec-managerial": "managerial-professional", "Prof-specialty": "managerial-professional",
    "Tech-support": "technical-sales-clerical", "Sales": "technical-sales-clerical",
    "Adm-clerical": "technical-sales-clerical", "Other-service": "service",
    "Priv-house-serv": "service", "Protective-serv": "service", "Craft-repair": "craft-repair",
    "Machine-op-inspct": "operators-laborers", "Handlers-cleaners": "operators-laborers",
    "Transport-moving": "operators-laborers", "Farming-fishing": "farming-fishing",
    "Armed-Forces": "armed-forces", "?": "unknown",
}
COUNTRY = {"United-States": "united-states", "?": "unknown"}
COUNTRY.update(dict.fromkeys([
    "Mexico", "Puerto-Rico", "El-Salvador", "Cuba", "Jamaica", "Dominican-Republic", "Guatemala",
    "Columbia", "Haiti", "Nicaragua", "Peru", "Ecuador", "Trinadad&Tobago", "Honduras",
    "Outlying-US(Guam-USVI-etc)"], "latin-america-caribbean"))
COUNTRY.update(dict.fromkeys(["Canada"], "canada"))
COUNTRY.update(dict.fromkeys([
    "Germany", "England", "Italy", "Poland", "Portugal", "France", "Greece", "Ireland",
    "Yugoslavia", "Hungary", "Scotland", "Holand-Netherlands"], "europe"))
COUNTRY.update(dict.fromkeys([
    "Philippines", "India", "South", "China", "Vietnam", "Japan", "Taiwan", "Iran", "Hong",
    "Cambodia", "Thailand", "Laos"], "asia"))


def _ordered(mapping: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(mapping.values()))


# (attribute spec, query kind)
ATTRIBUTES: list[tuple[dict, str]] = [
    ({"name": "age", "bins": [17, 25, 35, 45, 55, 65, ".inf"]}, "prefix"),
    ({"name": "workclass", "values": _ordered(WORKCLASS), "recode": WORKCLASS}, "identity"),
    ({"name": "fnlwgt", "bins": [0, 100000, 150000, 200000, 300000, ".inf"]}, "prefix"),
    ({"name": "education", "values": ["elementary", "some-high-school", "high-school", "some-college",
                                      "associate", "bachelors", "advanced"],
      "ordinal": True, "recode": EDUCATION}, "prefix"),
    ({"name": "marital_status", "column": "marital-status", "values": _ordered(MARITAL), "recode": MARITAL}, "identity"),
    ({"name": "occupation", "values": _ordered(OCCUPATION), "recode": OCCUPATION}, "identity"),
    ({"name": "relationship", "values": ["Husband", "Wife", "Own-child", "Other-relative",
                                         "Not-in-family", "Unmarried"]}, "identity"),
    ({"name": "race", "values": ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]},
     "identity"),
    ({"name": "sex", "values": ["Female", "Male"]}, "identity"),
    ({"name": "capital_gain", "column": "capital-gain", "bins": [0, 1, 5000, ".inf"], "values": ["0", "1-4999", "5000+"]}, "prefix"),
    ({"name": "capital_loss", "column": "capital-loss", "bins": [0, 1, 2000, ".inf"], "values": ["0", "1-1999", "2000+"]}, "prefix"),
    ({"name": "hours_per_week", "column": "hours-per-week", "bins": [1, 20, 35, 40, 41, 50, ".inf"]}, "prefix"),
    ({"name": "native_country", "column": "native-country", "values": _ordered(COUNTRY), "recode": COUNTRY}, "identity"),
    ({"name": "income", "values": ["<=50K", ">50K"]}, "identity"),
]


def build() -> dict:
    groups = []
    for triple in itertools.combinations(ATTRIBUTES, 3):
        names = [attribute["name"] for attribute, _ in triple]
        groups.append({"name": "-".join(names),
                       "attributes": {attribute["name"]: kind for attribute, kind in triple},
                       "target": dict(TARGET_RULE)})
    return {
        "name": "adult",
        "description": ("All 3-way marginals of the UCI Adult census extract (14 attributes; continuous "
                        "columns binned, categories grouped), prefix queries on the ordinal attributes. "
                        "Data: pipelines/data/adult.csv. Generated by generate_adult.py."),
        "attributes": [attribute for attribute, _ in ATTRIBUTES],
        "queries": groups,
        "privacy": {"mode": "accuracy"},
        # Unmerged residual blocks (at most 7 x 6 x 5 = 210 basis rows) solve in about a second
        # each; merging a clique's residual blocks (up to 4000 cells, 616 basis rows and about
        # 10,000 queries) takes minutes per block on 2 cores, for a few percent of privacy.
        "blocks": {"max_cells": 4096, "merge": False},
    }


def render() -> str:
    header = ("# Generated by pipelines/generate_adult.py; edit that script and rerun it.\n"
              "# Data: pipelines/data/adult.csv (UCI Adult, CC BY 4.0). Run:\n"
              "#   distfit run pipelines/adult.yaml --data pipelines/data/adult.csv --out runs/adult\n")
    return header + yaml.safe_dump(build(), sort_keys=False, width=100, allow_unicode=True,
                                   default_flow_style=None)


def main(argv: list[str]) -> int:
    return write_or_check(OUTPUT, render(), argv, Path(__file__).name, f"{len(build()['queries'])} query groups")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
