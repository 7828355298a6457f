"""Write ``pipelines/marginals.yaml``: all 2-way marginals of a 30-attribute census-like schema.

Run from anywhere: ``python pipelines/generate_marginals.py`` (deterministic; it writes only
``marginals.yaml`` next to this script, and ``--check`` exits 1 if that file is out of date).

Every attribute has a query kind that it uses in all of its groups (``identity`` for
categorical attributes; ``prefix`` or a fixed ``ranges`` list for ordinal ones) and a priority
weight from 1 (least important) to 5 (most important). The group of the pair (a, b) gets the
target rule

    {base: 1 + (10 - priority_a - priority_b) / 4, width_power: 0.25, jitter: 1}

so a pair of two priority-5 attributes has base 1 and a pair of two priority-1 attributes base 3;
each query's target is then base * (cells it reads) ** 0.25 * (a fixed pseudo-random factor in
[1, 2)), i.e. wide prefix and range queries are looser (``pipelines/README.md``, "target").
"""
from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generated.py, when loaded by path
from generated import write_or_check  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "marginals.yaml"
WIDTH_POWER = 0.25
JITTER = 1

# (name, value labels, ordinal, query kind, priority 1..5, comment)
ATTRIBUTES: list[tuple[str, list[str], bool, object, int, str]] = [
    ("age_band",
     ["0-4", "5-9", "10-14", "15-19", "20-24", "25-29", "30-34", "35-39", "40-44", "45-49",
      "50-54", "55-59", "60-64", "65-69", "70-74", "75-79", "80-84", "85+"],
     True, "prefix", 5, "five-year age bands"),
    ("sex", ["male", "female"], False, "identity", 5, ""),
    ("race", ["white", "black", "aian", "asian", "nhpi", "some_other_race", "two_or_more"],
     False, "identity", 5, "OMB race categories"),
    ("hispanic", ["not_hispanic", "hispanic"], False, "identity", 5, ""),
    ("marital_status", ["married", "widowed", "divorced", "separated", "never_married"],
     False, "identity", 3, ""),
    ("relationship",
     ["householder", "spouse", "unmarried_partner", "child", "grandchild", "parent", "sibling",
      "other_relative", "roommate", "other_nonrelative"],
     False, "identity", 2, "relationship to the householder"),
    ("education",
     ["no_schooling", "nursery_to_grade4", "grade5_to_8", "grade9", "grade10", "grade11",
      "grade12_no_diploma", "high_school_diploma", "ged", "some_college_under_1yr",
      "some_college_1yr_plus", "associate", "bachelor", "master", "professional", "doctorate"],
     True, "prefix", 4, "educational attainment (prefix: at most this level)"),
    ("school_enrollment", ["not_enrolled", "public_school", "private_school"],
     False, "identity", 2, ""),
    ("citizenship",
     ["born_in_us", "born_in_territory", "born_abroad_us_parents", "naturalized", "not_citizen"],
     False, "identity", 3, ""),
    ("english_ability", ["english_only", "very_well", "well", "not_well", "not_at_all"],
     True, "prefix", 3, "ability to speak English"),
    ("language_at_home",
     ["english_only", "spanish", "other_indo_european", "asian_pacific_island", "arabic", "other"],
     False, "identity", 2, ""),
    ("disability", ["no_disability", "with_disability"], False, "identity", 3, ""),
    ("health_insurance",
     ["employer", "direct_purchase", "medicare", "medicaid", "military_va", "uninsured"],
     False, "identity", 4, "primary health insurance coverage"),
    ("military_service",
     ["never_served", "veteran", "active_duty", "reserves_guard", "under_17"],
     False, "identity", 2, ""),
    ("employment_status",
     ["employed_at_work", "employed_absent", "unemployed", "armed_forces", "not_in_labor_force",
      "under_16"],
     False, "identity", 4, ""),
    ("class_of_worker",
     ["private_for_profit", "private_nonprofit", "local_government", "state_government",
      "federal_government", "self_employed_unincorporated", "self_employed_incorporated",
      "unpaid_family", "not_in_universe"],
     False, "identity", 3, ""),
    ("industry",
     ["agriculture", "mining", "utilities", "construction", "manufacturing", "wholesale_trade",
      "retail_trade", "transportation", "information", "finance_insurance", "real_estate",
      "professional_scientific", "management", "administrative_support", "educational_services",
      "health_care", "arts_recreation", "accommodation_food", "other_services",
      "public_administration"],
     False, "identity", 2, "NAICS sectors"),
    ("occupation",
     ["management_business", "computer_engineering_science", "education_legal_arts_media",
      "healthcare_practitioners", "healthcare_support", "protective_service", "food_service",
      "building_grounds", "personal_care", "sales", "office_admin", "farming_fishing",
      "construction_extraction", "installation_repair", "production", "transportation_moving",
      "military"],
     False, "identity", 2, "SOC major groups"),
    ("hours_per_week",
     ["0", "1-9", "10-19", "20-29", "30-34", "35-39", "40", "41-49", "50-59", "60+"],
     True, {"ranges": [[0, 0], [1, 3], [4, 5], [6, 6], [7, 9], [1, 4], [5, 9], [1, 9]]}, 3,
     "usual hours worked; ranges: none, 1-29, 30-39, 40, 41+, part time (1-34), "
     "full time (35+), any"),
    ("weeks_worked", ["none", "1-13", "14-26", "27-39", "40-47", "48-49", "50-52"],
     True, {"ranges": [[0, 0], [1, 3], [4, 5], [6, 6], [1, 6]]}, 2,
     "weeks worked last year; ranges: none, 1-39, 40-49, 50-52, any"),
    ("commute_mode",
     ["drove_alone", "carpooled", "bus", "subway", "railroad", "ferry", "taxi", "motorcycle",
      "bicycle", "walked", "worked_from_home", "other"],
     False, "identity", 2, ""),
    ("commute_minutes",
     ["none", "under_5", "5-9", "10-14", "15-19", "20-24", "25-29", "30-34", "35-44", "45-59",
      "60-89", "90+"],
     True, "prefix", 2, "travel time to work (prefix: at most this long)"),
    ("personal_income",
     ["loss_or_none", "1-4999", "5000-9999", "10000-14999", "15000-19999", "20000-24999",
      "25000-29999", "30000-34999", "35000-39999", "40000-44999", "45000-49999", "50000-59999",
      "60000-74999", "75000-99999", "100000-124999", "125000-149999", "150000-199999",
      "200000-249999", "250000-499999", "500000+"],
     True, "prefix", 4, "personal income in dollars (prefix: at most this band)"),
    ("household_income",
     ["under_10000", "10000-14999", "15000-19999", "20000-24999", "25000-29999", "30000-34999",
      "35000-39999", "40000-44999", "45000-49999", "50000-59999", "60000-74999", "75000-99999",
      "100000-124999", "125000-149999", "150000-199999", "200000+"],
     True, {"ranges": [[0, 3], [4, 8], [9, 11], [12, 13], [14, 15], [0, 8], [9, 15]]}, 4,
     "household income in dollars; ranges: under 25k, 25-50k, 50-100k, 100-150k, 150k+, "
     "under 50k, 50k+"),
    ("poverty_ratio",
     ["under_0.50", "0.50-0.99", "1.00-1.24", "1.25-1.49", "1.50-1.84", "1.85-1.99",
      "2.00-2.99", "3.00-3.99", "4.00_plus"],
     True, "prefix", 4, "income to poverty ratio (prefix: below a multiple of the line)"),
    ("tenure",
     ["owned_with_mortgage", "owned_free_and_clear", "rented", "occupied_without_rent"],
     False, "identity", 3, ""),
    ("household_size", ["1", "2", "3", "4", "5", "6", "7+"], True, "prefix", 2, "persons"),
    ("vehicles", ["0", "1", "2", "3", "4", "5+"], True, "prefix", 1, "vehicles available"),
    ("internet_access", ["broadband", "other_subscription", "access_no_subscription", "no_access"],
     False, "identity", 1, ""),
    ("region", ["northeast", "midwest", "south", "west"], False, "identity", 3, "census regions"),
]


def _scalar(value) -> str:
    """A YAML plain scalar when safe under the spec loader, else a quoted string."""
    text = str(value)
    if isinstance(value, int) or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and text not in (
            "true", "false", "True", "False", "TRUE", "FALSE", "null", "Null", "NULL", "y", "n"):
        return text
    return "'" + text.replace("'", "''") + "'"


def _kind(attribute: str, kind, anchored: set[str]) -> str:
    """The query kind; a ranges list is written once with a YAML anchor (``&hours_per_week``)
    and then referred to by alias (``*hours_per_week``)."""
    if isinstance(kind, str):
        return kind
    if attribute in anchored:
        return f"*{attribute}"
    anchored.add(attribute)
    (key, pairs), = kind.items()
    return f"&{attribute} {{{key}: [" + ", ".join(f"[{lo}, {hi}]" for lo, hi in pairs) + "]}"


def base_target(priority_a: int, priority_b: int) -> float:
    return 1.0 + (10 - priority_a - priority_b) / 4.0


def render() -> str:
    out = [
        "# GENERATED by pipelines/generate_marginals.py; edit that script, not this file.",
        "#",
        "# All 2-way marginals of a 30-attribute census-like person schema: 435 query groups,",
        "# each on at most 20 x 20 = 400 cells (blocks.max_cells). Categorical attributes are",
        "# queried with identity (the marginal), ordinal ones with prefix or a fixed list of ranges.",
        "#",
        "# Priorities (1 = least, 5 = most important) and the targets they give: the group of the",
        "# pair (a, b) has the target rule",
        "#   {base: 1 + (10 - priority_a - priority_b) / 4, width_power: 0.25, jitter: 1}",
        "# (base 1 for two priority-5 attributes, 3 for two priority-1 attributes); query j of the",
        "# group gets base * w_j ** 0.25 * (1 + u_j), where w_j is the number of cells of the pair's",
        "# marginal the query reads (so wide prefix and range queries are looser) and u_j in [0, 1)",
        "# is a fixed pseudo-random number of the group name and j (pipelines/README.md, target).",
        "#",
        "#   attribute            size  kind       priority",
    ]
    for name, values, ordinal, kind, priority, _ in ATTRIBUTES:
        shown = kind if isinstance(kind, str) else "ranges"
        out.append(f"#   {name:<20} {len(values):>4}  {shown:<10} {priority}")
    out += [
        "name: marginals",
        "description: >-",
        "  All 2-way marginals of a 30-attribute census-like person schema (age, race, education,",
        "  work, income, commuting, housing): 435 groups with prefix and range queries on the ordinal",
        "  attributes and per-query targets from the attributes' priorities.",
        "",
        "attributes:",
    ]
    for name, values, ordinal, kind, priority, comment in ATTRIBUTES:
        note = f"{comment}; priority {priority}" if comment else f"priority {priority}"
        if len(f"  - name: {name}  # {note}") <= 96:
            out.append(f"  - name: {name}  # {note}")
        else:  # a long comment goes on its own lines above the attribute
            words, line = note.split(), "  #"
            for word in words:
                if len(line) + 1 + len(word) > 96:
                    out.append(line)
                    line = "  #"
                line += " " + word
            out += [line, f"  - name: {name}"]
        labels = ", ".join(_scalar(v) for v in values)
        lines, line = [], "    values: ["
        for piece in labels.split(", "):
            candidate = line + ("" if line.endswith("[") else ", ") + piece
            if len(candidate) > 96 and not line.endswith("["):
                lines.append(line + ",")
                line = "        " + piece
            else:
                line = candidate
        lines.append(line + "]")
        out += lines
        if ordinal:
            out.append("    ordinal: true")
    out += [
        "",
        "# One group per pair of attributes, in schema order. A ranges list is spelled out (value",
        "# indices) at its first use with a YAML anchor (&hours_per_week) and later named by alias",
        "# (*hours_per_week).",
        "queries:",
    ]
    anchored: set[str] = set()
    for (a, _, _, kind_a, pa, _), (b, _, _, kind_b, pb, _) in itertools.combinations(ATTRIBUTES, 2):
        base = base_target(pa, pb)
        out.append(
            f"  - {{name: {a}-{b}, attributes: {{{a}: {_kind(a, kind_a, anchored)}, "
            f"{b}: {_kind(b, kind_b, anchored)}}}, "
            f"target: {{base: {base:g}, width_power: {WIDTH_POWER:g}, jitter: {JITTER}}}}}")
    out += [
        "",
        "privacy:",
        "  mode: accuracy",
        "",
        "blocks:",
        "  max_cells: 400",
        "  merge: true",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    return write_or_check(OUTPUT, render(), argv, Path(__file__).name,
                          f"{len(ATTRIBUTES)} attributes, {len(ATTRIBUTES) * (len(ATTRIBUTES) - 1) // 2} groups")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
