from textstats import most_common_word, word_count


def test_simple_sentence() -> None:
    assert word_count("the quick brown fox") == 4


def test_empty_text_has_no_words() -> None:
    assert word_count("") == 0


def test_repeated_spaces() -> None:
    assert word_count("two  spaces   here") == 3


def test_newlines_and_tabs() -> None:
    assert word_count("one\ntwo\tthree") == 3


def test_most_common_word() -> None:
    assert most_common_word("a b A c") == "a"


def test_most_common_word_of_blank_text() -> None:
    assert most_common_word("   ") is None
