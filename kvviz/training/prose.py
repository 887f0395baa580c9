"""General prose that is in no corpus: short paragraphs written for this project (same license as kvviz).

They measure how a model does on everyday text outside its training domain (bits per byte per language),
so the numbers for the old and the new shipped model are comparable on the same bytes.
"""
from __future__ import annotations

ENGLISH = (
    "The bakery on the corner opens before sunrise. By six o'clock the windows are fogged with steam, and a "
    "short line of people waits on the pavement, some reading the news on their phones, others simply watching "
    "the street wake up. The owner learned to bake from her grandmother, who never wrote a recipe down.",

    "Rivers change their course more often than most maps suggest. A flood can cut a new channel in a single "
    "night, leaving the old bend behind as a quiet lake. Farmers who lived beside such rivers learned to read "
    "the colour of the water and the height of the banks long before anyone measured them.",

    "When the train stopped between two stations, nobody spoke at first. After ten minutes a voice explained "
    "that a tree had fallen across the line. People began to share snacks and stories, and by the time the "
    "train moved again, several passengers had exchanged addresses and promised to write.",

    "A good teacher does not answer every question at once. She waits, asks what the student already knows, "
    "and lets the silence do some of the work. The answer that a student finds for herself is the one she "
    "will still remember years later, long after the test has been forgotten.",

    "In winter the village depends on a single road over the mountain. When snow closes it, the shop runs out "
    "of fresh milk within three days, and the children are happy because the school stays closed. The old men "
    "in the cafe say the winters were harder when they were young, but nobody believes them.",
)

KOREAN = (
    "골목 모퉁이의 빵집은 해가 뜨기 전에 문을 연다. 여섯 시가 되면 유리창에는 김이 서리고, 가게 앞에는 "
    "몇 사람이 줄을 서서 기다린다. 주인은 할머니에게서 빵 굽는 법을 배웠는데, 할머니는 조리법을 한 번도 "
    "글로 적어 두지 않았다고 한다.",

    "강은 지도에 그려진 것보다 훨씬 자주 물길을 바꾼다. 큰 홍수가 나면 하룻밤 사이에 새 물길이 생기고, "
    "예전의 굽이는 조용한 호수로 남는다. 강가에 살던 농부들은 물의 색과 둑의 높이를 보고 날씨를 짐작하는 "
    "법을 오래전부터 알고 있었다.",

    "기차가 두 역 사이에서 멈추자 처음에는 아무도 말을 하지 않았다. 십 분쯤 지나서야 나무가 선로 위로 "
    "쓰러졌다는 안내 방송이 나왔다. 사람들은 간식을 나누고 이야기를 주고받기 시작했고, 기차가 다시 움직일 "
    "무렵에는 몇몇 승객이 서로 연락처를 주고받았다.",

    "좋은 선생님은 모든 질문에 바로 답하지 않는다. 학생이 이미 무엇을 알고 있는지 묻고, 잠시 기다리며 "
    "침묵이 일을 하게 둔다. 학생이 스스로 찾은 답은 시험이 끝나고 한참이 지난 뒤에도 오래 기억에 남는다.",

    "겨울이 되면 마을은 산을 넘는 길 하나에 기대어 산다. 눈이 길을 막으면 사흘 만에 가게의 우유가 "
    "떨어지고, 학교가 문을 닫아 아이들은 즐거워한다. 찻집의 노인들은 젊었을 때 겨울이 더 혹독했다고 "
    "말하지만 그 말을 믿는 사람은 없다.",
)

PROSE = {"en": ENGLISH, "ko": KOREAN}
