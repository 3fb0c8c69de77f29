"""Reasoning Gym family lists: 21 families for SFT, 5 for RL and 21 held out for evaluation, the
families excluded from every list, and what each listed family's scorer does with an answer.

Held-out families differ from the training ones in kind, not just in instance: training (SFT and
RL) uses only reasoning-gym's `arithmetic`, `algorithmic` (string and list manipulation) and
`algebra` categories, while the held-out families come from `games` (grid puzzles), `logic`,
`graphs`, `cognition`, `geometry` and `arc`. No category is shared, and
`hljax.tasks.reasoning_gym.FamilyLists.shipped()` checks that at load time, along with unknown names,
overlaps and excluded families. Grid-simulation families of `algorithmic` (rotten_oranges,
game_of_life, binary_matrix, the *_matrix families) are kept out of training because they
resemble the held-out grid and graph puzzles.

Every listed family was checked offline with reasoning-gym 0.1.25: it builds lazily (no pool
generated up front), generates in about a millisecond or less per question, repeats few questions
(<= 15% over 2000 draws, except prime_factorization, whose repeats the splits skip), gives the
same questions for the same seed whatever the access order, its reference answer scores 1.0 in
every answer format and a wrong answer scores below 1.0 (tests/test_tasks_reasoning_gym.py).
"""

SFT = (
    # arithmetic
    "basic_arithmetic", "chain_sum", "decimal_arithmetic", "fraction_simplification", "gcd", "lcm",
    "prime_factorization", "products", "power_function", "bitwise_arithmetic", "count_bits",
    "leg_counting", "number_format",
    # algorithmic: string and list manipulation
    "base_conversion", "caesar_cipher", "letter_counting", "number_sorting", "spell_backward",
    "word_sorting", "word_sequence_reversal",
    # algebra
    "complex_arithmetic",
)  # fmt: skip

RL = ("calendar_arithmetic", "gsm_symbolic", "number_filtering", "count_primes", "simple_equations")

HELDOUT = (
    # games: grid and board puzzles
    "maze", "mini_sudoku", "n_queens", "survo", "tsumego", "kakurasu",
    # logic
    "aiw", "circuit_logic", "knights_knaves", "syllogism",
    # graphs
    "course_schedule", "family_relationships", "largest_island", "shortest_path", "path_star",
    # cognition: spatial and perceptual
    "color_cube_rotation", "modulo_grid", "needle_haystack", "rectangle_count",
    # geometry and abstraction
    "simple_geometry", "arc_1d",
)  # fmt: skip

# Families unfit for any list, with the measured reason (reasoning-gym 0.1.25, 2 CPU cores).
# Listing one of them is a load-time error. Fit families not listed above are simply unused.
EXCLUDED = {
    "boxnet": "stored answer is None; the scorer checks a plan, so the reference cannot score 1.0",
    "graph_color": "stored answer is None; the scorer checks a colouring, the reference cannot score 1.0",
    "propositional_logic": "stored answer is None; the reference cannot score 1.0",
    "rubiks_cube": "stored answer is None; the reference cannot score 1.0",
    "rush_hour": "stored answer is None; the reference cannot score 1.0",
    "game_of_life_halting": "scorer gives 1.0 to the garbage answer 'definitely wrong 12345'",
    "composite": "needs a config of sub-datasets; not a family of its own",
    "tower_of_hanoi": "tiny question space: 90 distinct questions in 600 draws",
    "coin_flip": "tiny question space: 225 distinct questions in 600 draws",
    "string_splitting": "tiny question space: 216 distinct questions in 2000 draws",
    "string_synthesis": "tiny question space: 216 distinct questions in 2000 draws",
    "bf": "generation prints progress dots to stdout",
    "codeio": "generation prints errors to stdout; 11k-character prompts",
    "knight_swap": "slow: about 0.4 s per question",
    "futoshiki": "slow: about 0.26 s per question",
    "zebra_puzzles": "slow: about 0.1 s per question",
    "puzzle24": "slow: about 0.06 s per question",
    "sokoban": "slow: about 0.05 s per question",
    "polynomial_equations": "slow: about 13 ms per question; its scorer returns int 0 for wrong answers",
    "list_functions": "not reproducible: its generators draw from the global random module, not the seeded rng",
    "acre": "generates the whole pool up front: 5 s to build 20,000 questions",
    "isomorphic_strings": "not reproducible across processes: its questions follow Python's hash randomisation",
    "ransom_note": "not reproducible across processes: its questions follow Python's hash randomisation",
    "word_ladder": "not reproducible across processes: its questions follow Python's hash randomisation",
}

# What each listed family's scorer does with the (untrusted) answer, read from reasoning-gym
# 0.1.25's source: does it eval/exec, ast.literal_eval or sympy-parse it? Documentation only:
# every family's answers are scored in the isolated scorer process (sandbox/scoring.py), each in
# its own forked child, whatever this says. Only n_queens runs answer text as code; in the scorer
# process its `eval` is replaced by ast.literal_eval (hljax/tasks/scorers.py LITERAL_EVAL_ONLY).
# "exact/substring": the base scorer (answer == reference, else partial credit if the reference
# is a substring).
_EXACT = "exact/substring compare; nothing evaluated"
SCORER_AUDIT = {
    # SFT
    "basic_arithmetic": _EXACT + " (eval is used only to compute the reference at generation)",
    "chain_sum": "Decimal(answer) after stripping commas, then substring; nothing evaluated",
    "decimal_arithmetic": "Decimal(answer) within a tolerance; nothing evaluated",
    "fraction_simplification": "regex, int() of numerator and denominator; nothing evaluated",
    "gcd": _EXACT,
    "lcm": _EXACT,
    "prime_factorization": "split on 'x', int() of each factor (raises on non-numbers); nothing evaluated",
    "products": "Decimal(answer) after stripping commas, then substring; nothing evaluated",
    "power_function": "Decimal(answer), quantized to 3 significant figures; nothing evaluated",
    "bitwise_arithmetic": "int(answer, 0); eval() only of the generated problem text, never of the answer",
    "count_bits": _EXACT,
    "leg_counting": _EXACT,
    "number_format": "float(answer) after stripping commas; nothing evaluated",
    "base_conversion": _EXACT,
    "caesar_cipher": _EXACT,
    "letter_counting": _EXACT,
    "number_sorting": "json.loads(answer) (quotes swapped); eval() only of the reference if it is not JSON",
    "spell_backward": "case-folded compare, per-letter credit; nothing evaluated",
    "word_sorting": "split on commas, list compare; nothing evaluated",
    "word_sequence_reversal": _EXACT,
    "complex_arithmetic": "hand-written parser into complex()/float(); nothing evaluated",
    # RL
    "calendar_arithmetic": "strip/compare, int(answer) for counts; nothing evaluated",
    "gsm_symbolic": "regex for the first number, float(); nothing evaluated",
    "number_filtering": _EXACT,
    "count_primes": _EXACT,
    "simple_equations": _EXACT,
    # held out
    "maze": _EXACT,
    "mini_sudoku": "line compare, else digits per row; nothing evaluated",
    "n_queens": "EVAL: eval(answer) when it is not a listed solution, i.e. runs the answer as Python",
    "survo": "int() of whitespace-separated cells; nothing evaluated",
    "tsumego": "upper-cased compare, regex; nothing evaluated",
    "kakurasu": "0/1 characters per line; nothing evaluated",
    "aiw": _EXACT,
    "circuit_logic": "exact compare (stripped: partial credit); nothing evaluated",
    "knights_knaves": "word split into (name, role) pairs; nothing evaluated",
    "syllogism": _EXACT,
    "course_schedule": _EXACT,
    "family_relationships": "case-folded compare; nothing evaluated",
    "largest_island": _EXACT,
    "shortest_path": "exact compare, else walks the path's direction words on the grid; nothing evaluated",
    "path_star": "whitespace-normalised compare; nothing evaluated",
    "color_cube_rotation": "case-folded compare; nothing evaluated",
    "modulo_grid": _EXACT,
    "needle_haystack": "case-folded compare without spaces; nothing evaluated",
    "rectangle_count": "int(answer), partial credit by distance; nothing evaluated",
    "simple_geometry": _EXACT,
    "arc_1d": _EXACT,
}
# No listed family's scorer uses exec, ast.literal_eval, or sympy's sympify/parse_expr on the answer.

