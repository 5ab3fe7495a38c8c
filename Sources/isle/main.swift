print("isle")
