"""The second half of tests/test_kernel_code_predictor_path.py's interpreter checks, in its own interpreter child:
the joint 2-token first step (CP_JOINT_PREFILL, at twelve rows and at one row), the folded head (CP_FOLDED_HEAD) and
the folded layers' GEMMs on skinny_linear (CP_SKINNY_GEMMS).

Why a second file: the whole set took ~6 minutes in one child on the 2-core CI machine, over half of run_child's
600 s limit, and one file goes to one pytest-xdist worker (`--dist loadfile`), so it also ran alone at the end of
the suite. The checks and their helpers stay in test_kernel_code_predictor_path.py; here they only run.
"""
from __future__ import annotations

import pytest

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

from test_kernel_code_predictor_path import (check_cp_skinny_gemms_against_reference,  # noqa: E402
                                             check_folded_head_against_reference,
                                             check_joint_prefill_against_reference, check_joint_prefill_at_one_row)

CHILD_FLAG = "VOXFLOW_CP_PATH_JOINT_CHILD"
IN_CHILD = in_child(CHILD_FLAG)

if IN_CHILD:
    def test_child_folded_head_against_reference():
        check_folded_head_against_reference()

    def test_child_joint_prefill_against_reference():
        check_joint_prefill_against_reference()

    def test_child_joint_prefill_at_one_row():
        check_joint_prefill_at_one_row()

    def test_child_cp_skinny_gemms_against_reference():
        check_cp_skinny_gemms_against_reference()
else:
    def test_code_predictor_joint_step_and_folded_head_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)
